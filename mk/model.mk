# `make model` (issue 20): the request protocol as a Promela model, checked with
# SPIN (Debian's spin package, installed here as root when missing).  The real
# model must hold; every broken variant must be caught.  See model/airlock.pml
# and docs/architecture.md ("What the model proves").

MODEL_PACKAGES := spin gcc

.PHONY: model model-deps

model-deps:
	$(call apt-need,$(MODEL_PACKAGES))

model: model-deps
	bash model/check
