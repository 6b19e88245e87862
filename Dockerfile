# The hook image: `infera-hooks serve` under gunicorn, as a non-root user, on port 8080.
# The base is pinned to one Python release on one Debian release, so that a rebuild gets the
# same interpreter; add its digest (@sha256:...) where your registry policy asks for one.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Exactly what .dockerignore lets into the build context.
COPY pyproject.toml README.md LICENSE ./
COPY hooks ./hooks
RUN pip install --no-cache-dir . \
    && rm -rf /src

# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["infera-hooks"]
CMD ["serve", "--bind", "0.0.0.0:8080", "--workers", "2"]
