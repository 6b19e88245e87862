# The hook image: `infera-hooks serve` under gunicorn, as a non-root user, on port 8080.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hooks ./hooks
RUN pip install --no-cache-dir . \
    && rm -rf /src

# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["infera-hooks"]
CMD ["serve", "--bind", "0.0.0.0:8080", "--workers", "2"]
