# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: run test lint

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	@# setuptools' notice about editable installs says nothing to act on: keep installs quiet.
	PYTHONWARNINGS="ignore:Editable installation" $(VENV)/bin/python -m pip install -q -e '.[dev,agent]'
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(VENV)/bin/python -m controlplane.launcher

test: $(STAMP)
	VENV=$(VENV) bash scripts/test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
