# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Each installs what it needs first; running them again installs nothing new.
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore

.PHONY: demo test lint install graphviz chromium benchmark

demo: install
	$(PYTHON) -m graphtrace demo

test: install chromium lint
	$(PYTHON) -m pytest

# Static checks, part of the test command: ruff's lint rules and formatting, mypy --strict on graphtrace/ (pyproject.toml).
lint: install
	$(PYTHON) -m ruff check graphtrace tests benchmarks examples
	$(PYTHON) -m ruff format --check graphtrace tests benchmarks examples
	$(PYTHON) -m mypy

install: graphviz
	$(PIP_INSTALL) -c constraints/ci.txt -e '.[test]'

# Graphviz's `dot` renders the call graph; Debian's package provides it.
graphviz:
	@command -v dot >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq graphviz >/dev/null; }

# Debian's Chromium runs the explorer page's tests (tests/test_html_view.py), headless, driven over DevTools.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

benchmark: install
	$(PYTHON) -m benchmarks
