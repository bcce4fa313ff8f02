# Two commands a new user runs: `make demo` (train on generated clips, this machine) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A plain `pip install torch` pulls a multi-GB CUDA build; pin the release this project is tested with.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel setuptools
	$(PIP) install -q "$(TORCH_SPEC)" numpy packaging psutil py-cpuinfo ninja hjson msgpack einops pydantic
	# DeepSpeed's setup imports torch: build it against the torch installed above.
	$(PIP) install -q --no-build-isolation "deepspeed==0.19.8"
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

demo: install
	bash scripts/demo.sh

test: install
	bash scripts/test.sh

clean:
	rm -rf $(VENV) demo .pytest_cache
