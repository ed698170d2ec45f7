# One image for every component; compose.yaml picks the component with --component.
FROM python:3.11-slim
RUN useradd --system --home-dir /var/lib/registry-coordinator --create-home coordinator
WORKDIR /opt/registry-coordinator
COPY pyproject.toml README.md ./
COPY core core
COPY gateway gateway
COPY admission admission
COPY dispatcher dispatcher
COPY recovery recovery
COPY auditd auditd
COPY cli cli
COPY devstack devstack
RUN pip install --no-cache-dir .
USER coordinator
ENTRYPOINT ["coordinator"]
