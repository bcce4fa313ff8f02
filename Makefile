# Two commands a new user runs: `make demo` (train on generated clips, this machine) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A plain `pip install torch` pulls a multi-GB CUDA build; pin the release this project is tested with.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# pip compiles every module it installs to bytecode: ~15,000 files, ~50 CPU-s, two thirds of a
# 73-second install on a 2-core machine. Python writes the same bytecode for a module the first time
# it is imported, and most are never imported, so the install leaves it to Python, except where
# Python writes none (PYTHONDONTWRITEBYTECODE, set in many containers): there every process would
# compile torch from source (torch, DeepSpeed and accelerate imported: 2.6 s -> 6.3 s), so the
# install compiles everything.
PIP_COMPILE := $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q $(PIP_COMPILE) --upgrade pip wheel setuptools
	$(PIP) install -q $(PIP_COMPILE) "$(TORCH_SPEC)" numpy packaging psutil py-cpuinfo ninja hjson msgpack einops pydantic
	# DeepSpeed's setup imports torch: build it against the torch installed above.
	$(PIP) install -q $(PIP_COMPILE) --no-build-isolation "deepspeed==0.19.8"
	$(PIP) install -q $(PIP_COMPILE) -e ".[test]"
	touch $(STAMP)

demo: install
	bash scripts/demo.sh

test: install
	bash scripts/test.sh

clean:
	rm -rf $(VENV) demo .pytest_cache
