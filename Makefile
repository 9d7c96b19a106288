# make demo: create .venv if missing, install, evaluate the pyautoattack CIFAR-10 ResNet-18 undefended and
#            behind bit-depth reduction (BPDA gradients) with the default battery; print the table.
# make test: create .venv if missing, run the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.harness-installed
# samples per demo run: sized to finish in about 10 minutes on 2 CPU cores (see README)
DEMO_N ?= 200
DEMO_OUT ?= runs
DEMO_FLAGS ?= --n $(DEMO_N) --seed 0 --attacks standard --out $(DEMO_OUT)
# data: $HARNESS_DATA if set, else the offline copy in ../shared/data, else torchvision downloads CIFAR-10
SHARED_DATA := $(abspath ../shared/data)
ifeq ($(HARNESS_DATA),)
  ifneq ($(wildcard $(SHARED_DATA)/cifar10_test.npz),)
    export HARNESS_DATA := $(SHARED_DATA)
  else
    DEMO_FLAGS += --download
  endif
endif

.PHONY: demo test venv clean-demo

venv: $(STAMP)

# re-runs only when pyproject.toml changes; a no-op (a stat) when already installed
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/harness run --defense none --run-id demo-none $(DEMO_FLAGS)
	$(BIN)/harness run --defense bit-depth --defense-opt bits=4 --grad bpda --run-id demo-bit-depth $(DEMO_FLAGS)
	$(BIN)/harness report $(DEMO_OUT)/demo-none $(DEMO_OUT)/demo-bit-depth

test: $(STAMP)
	$(BIN)/pytest

clean-demo:
	rm -rf $(DEMO_OUT)/demo-none $(DEMO_OUT)/demo-bit-depth
