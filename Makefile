# `make app` installs and runs the main job; `make test` installs and runs the tests.
# Each creates .venv when it is missing (Python >= 3.11 as python3).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

app: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/mediagen app

test: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q

.PHONY: install app test
