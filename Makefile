# make demo: create .venv if missing, install, evaluate the two adversarially trained small CNNs shipped in
#            defenses/weights (at-small, and a3-small with the A3 module) with APGD-CE + APGD-T on DEMO_N test
#            images, print their table and paired comparison, then the same for all 10,000 test images from
#            the shipped per-sample records in results/cifar10-linf.
# make test: create .venv if missing, run the linters (ruff, import-linter's contracts, mypy on harness/api and harness/stats) and the test suite
#            (pytest-xdist: one worker per core; the tests marked xdist_group(NAME) in one worker).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the package alone (what `make demo` needs), then its test extras (Ray, diffusers, the linters: `make test`)
STAMP := $(VENV)/.harness-installed
TEST_STAMP := $(VENV)/.harness-test-installed
# samples per demo run: sized to finish in about 5 minutes on 2 CPU cores, installing included (see README)
DEMO_N ?= 500
DEMO_OUT ?= runs
DEMO_FLAGS ?= --n $(DEMO_N) --seed 0 --attacks apgd-ce,apgd-t --out $(DEMO_OUT)
SHIPPED := results/cifar10-linf
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
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/harness run --defense at-small --run-id demo-at-small $(DEMO_FLAGS)
	$(BIN)/harness run --defense a3-small --run-id demo-a3-small $(DEMO_FLAGS)
	@echo; echo "== $(DEMO_N) test images, measured now =="
	$(BIN)/harness report $(DEMO_OUT)/demo-at-small $(DEMO_OUT)/demo-a3-small
	$(BIN)/harness compare $(DEMO_OUT)/demo-at-small $(DEMO_OUT)/demo-a3-small
	@echo; echo "== all 10,000 test images, from the shipped records in $(SHIPPED) (commands: $(SHIPPED)/README.md) =="
	$(BIN)/harness report $(SHIPPED)/at-small $(SHIPPED)/a3-small
	$(BIN)/harness compare $(SHIPPED)/at-small $(SHIPPED)/a3-small

test: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -n auto --dist loadgroup --durations=40

clean-demo:
	rm -rf $(DEMO_OUT)/demo-at-small $(DEMO_OUT)/demo-a3-small
