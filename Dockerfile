# One image for every component; compose.yaml picks the component with --component.
#
# Two stages. `build` turns the source into the wheel and is thrown away. `runtime` is what
# ships: Python, a virtual environment at /opt/registry-coordinator holding exactly the
# pinned, hash-checked packages of deploy/requirements.lock plus that wheel, and a non-root user.
# Neither stage needs grpcio-tools (the gRPC stubs are committed under core/rpc) or devstack.
# RUN --mount needs BuildKit, the default builder of current Docker and of Compose.

# A fixed patch release of the base image. Pin it further by digest where your registry
# policy asks for one: python:3.11.14-slim-trixie@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY gateway gateway
COPY admission admission
COPY dispatcher dispatcher
COPY recovery recovery
COPY auditd auditd
COPY cli cli
RUN python -m pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
      --wheel-dir /dist .

FROM ${PYTHON_IMAGE} AS runtime
# The service's own account. Fixed numbers, so that volumes, secrets mounted from the host
# and a compose file's `user:` can name the owner; override with --build-arg if they clash.
ARG COORDINATOR_UID=10001
ARG COORDINATOR_GID=10001
LABEL org.opencontainers.image.title="Registry Coordinator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.registry-coordinator.uid="${COORDINATOR_UID}" \
      io.registry-coordinator.gid="${COORDINATOR_GID}"
ENV PATH=/opt/registry-coordinator/bin:$PATH \
    PYTHONUNBUFFERED=1

# The home folder holds the audit journal (a volume in compose.yaml): created here, owned
# by the service, so a named volume mounted over it starts with that owner.
RUN groupadd --system --gid "${COORDINATOR_GID}" coordinator \
 && useradd --system --uid "${COORDINATOR_UID}" --gid coordinator \
      --home-dir /var/lib/registry-coordinator --shell /usr/sbin/nologin coordinator \
 && install -d -o coordinator -g coordinator -m 0700 /var/lib/registry-coordinator

# The lock and the wheel are mounted for this one step, not copied, so neither stays in a
# layer. --require-hashes refuses any file the lock does not name; --no-deps on both lines
# keeps pip from fetching anything else; pip check proves the lock covers the wheel.
RUN --mount=type=bind,source=deploy/requirements.lock,target=/tmp/requirements.lock \
    --mount=type=bind,from=build,source=/dist,target=/tmp/dist \
    python -m venv /opt/registry-coordinator \
 && /opt/registry-coordinator/bin/pip install --no-cache-dir --disable-pip-version-check \
      --require-hashes --no-deps -r /tmp/requirements.lock \
 && /opt/registry-coordinator/bin/pip install --no-cache-dir --disable-pip-version-check \
      --no-deps /tmp/dist/registry_coordinator-*-py3-none-any.whl \
 && /opt/registry-coordinator/bin/pip check

USER ${COORDINATOR_UID}:${COORDINATOR_GID}
WORKDIR /var/lib/registry-coordinator
ENTRYPOINT ["/opt/registry-coordinator/bin/coordinator"]
