# One command to see it work, one to test it: `make demo`, `make test`. Each target first makes the virtual
# environment ready (scripts/dev-env.sh: .venv, torch, flashcute with its extras; nothing when all is there).
# Variables: TORCH=auto|cpu|cuda|<pip requirement>, TORCH_VERSION (default 2.13.0), PYTHON, VENV, and ARGS for the
# commands that take options (make bench ARGS="--quick").
VENV ?= .venv
PYTHON ?= python3
TORCH ?= auto
TORCH_VERSION ?= 2.13.0
ARGS ?=
export VENV PYTHON TORCH TORCH_VERSION

BIN := $(VENV)/bin

.DEFAULT_GOAL := help
.PHONY: help env demo test bench check walkthrough lint clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z]+):.*## (.*)/  make \1\t\2/' | expand -t 20

env: ## make .venv ready (torch, flashcute and its extras)
	@bash scripts/dev-env.sh

demo: env ## flashcute against PyTorch SDPA on a GPU; the CPU reference without one
	@$(BIN)/flashcute demo $(ARGS)

test: env ## the test suite, as the README runs it (a few minutes on 2 cores)
	@$(BIN)/pytest $(ARGS)

bench: env ## the benchmark sweep (needs a GPU)
	@$(BIN)/flashcute bench $(ARGS)

check: env ## compile every kernel variant without a GPU; registers, spills, SASS
	@$(BIN)/flashcute check $(ARGS)

walkthrough: env ## the article's worked example, round by round
	@$(BIN)/flashcute walkthrough $(ARGS)

lint: env ## ruff: lint and format check
	@$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean: ## remove .venv and the build, test and benchmark outputs
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis out
