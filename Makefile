# make demo: create .venv if missing, install, evaluate the two adversarially trained small CNNs shipped in
#            defenses/weights (at-small, and a3-small with the A3 module) with APGD-CE + APGD-T on DEMO_N test
#            images, side by side (half the cores each; at-small's progress in $(DEMO_OUT)/demo-at-small.log),
#            print their table and paired comparison, then the same for all 10,000 test images from the shipped
#            per-sample records in results/cifar10-linf.
# make test: create .venv if missing, run the linters (ruff, import-linter's contracts, mypy on the rooms pyproject.toml lists) and the test suite
#            (pytest-xdist: one worker per core; the tests marked xdist_group(NAME) in one worker).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the package alone (what `make demo` needs), then its test extras (Ray, diffusers, the linters: `make test`)
STAMP := $(VENV)/.harness-installed
TEST_STAMP := $(VENV)/.harness-test-installed
# samples per demo run: sized to finish in about 4 minutes on 2 CPU cores, installing included (see README)
DEMO_N ?= 500
DEMO_OUT ?= runs
# the two evaluations run side by side, each on half the cores: two small CNNs use two processes better than one
# process uses two threads (on 2 CPU cores: 38 s side by side against 52 s one after the other, 100 images)
DEMO_THREADS ?= $(shell $(PYTHON) -c 'import os; print(max(1, (os.cpu_count() or 2) // 2))')
DEMO_FLAGS ?= --n $(DEMO_N) --seed 0 --attacks apgd-ce,apgd-t --out $(DEMO_OUT) --threads $(DEMO_THREADS)
SHIPPED := results/cifar10-linf
# data: $HARNESS_DATA if set, else the offline copy in ../shared/data, else torchvision downloads CIFAR-10
SHARED_DATA := $(abspath ../shared/data)
ifeq ($(HARNESS_DATA),)
  ifneq ($(wildcard $(SHARED_DATA)/cifar10_test.npz),)
    export HARNESS_DATA := $(SHARED_DATA)
  else
    # torchvision downloads CIFAR-10 in the first run: the two run one after the other, each on every core
    DEMO_FLAGS += --download
    DEMO_THREADS = $(shell $(PYTHON) -c 'import os; print(os.cpu_count() or 1)')
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
ifneq ($(findstring --download,$(DEMO_FLAGS)),)
	$(BIN)/harness run --defense at-small --run-id demo-at-small $(DEMO_FLAGS)
	$(BIN)/harness run --defense a3-small --run-id demo-a3-small $(DEMO_FLAGS)
else
	@mkdir -p $(DEMO_OUT)
	@echo "evaluating at-small (progress in $(DEMO_OUT)/demo-at-small.log) and a3-small (below) side by side"
	@$(BIN)/harness run --defense at-small --run-id demo-at-small $(DEMO_FLAGS) > $(DEMO_OUT)/demo-at-small.log 2>&1 & \
	  other=$$!; \
	  $(BIN)/harness run --defense a3-small --run-id demo-a3-small $(DEMO_FLAGS); mine=$$?; \
	  if ! wait $$other; then echo "the at-small run failed; the end of $(DEMO_OUT)/demo-at-small.log:"; \
	    tail -n 5 $(DEMO_OUT)/demo-at-small.log; exit 1; fi; \
	  exit $$mine
endif
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
	rm -rf $(DEMO_OUT)/demo-at-small $(DEMO_OUT)/demo-a3-small $(DEMO_OUT)/demo-at-small.log
