# One image for every component; compose.yaml picks the component with --component.
#
# Built from the two files a release consists of (docs/install-and-package.md): the wheel
# `make wheel` writes into dist/ and deploy/requirements.lock, with the lock's files fetched
# beforehand into dist/wheels (`make wheels`). The image installs exactly those bytes, the
# way the install chapter installs them on a host: a virtual environment at
# /opt/registry-coordinator holding the pinned, hash-checked packages of the lock plus that
# wheel, and a non-root user. Nothing is compiled and nothing is fetched while it builds, so
# the build needs no network (`docker build --network=none` works):
#
#   make wheel wheels      # dist/registry_coordinator-<version>-py3-none-any.whl, dist/wheels/
#   docker build -t registry-coordinator:local .
#
# dist/ must hold one registry_coordinator wheel (`make wheel` removes older ones). RUN
# --mount needs BuildKit, the default builder of current Docker and Compose (Docker 20.10:
# DOCKER_BUILDKIT=1).

# A fixed patch release of the base image. Pin it further by digest where your registry
# policy asks for one: python:3.11.14-slim-trixie@sha256:<digest>. Any Debian-like image
# with python3 (3.11 or later, with its venv module), groupadd and useradd will do.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE}
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

# The lock and dist/ are mounted for this one step, not copied, so neither stays in a layer.
# pip reads no package index (--no-index): the lock's files come from dist/wheels and
# --require-hashes refuses any whose hash the lock does not list; --no-deps on both installs
# keeps pip from wanting anything else; pip check proves the lock covers the wheel. A glob
# that matches no wheel, or two, fails the install.
RUN --mount=type=bind,source=deploy/requirements.lock,target=/tmp/requirements.lock \
    --mount=type=bind,source=dist,target=/tmp/dist \
    python3 -m venv /opt/registry-coordinator \
 && /opt/registry-coordinator/bin/pip install --no-cache-dir --disable-pip-version-check \
      --no-index --find-links /tmp/dist/wheels --require-hashes --no-deps \
      -r /tmp/requirements.lock \
 && /opt/registry-coordinator/bin/pip install --no-cache-dir --disable-pip-version-check \
      --no-index --no-deps /tmp/dist/registry_coordinator-*-py3-none-any.whl \
 && /opt/registry-coordinator/bin/pip check

USER ${COORDINATOR_UID}:${COORDINATOR_GID}
WORKDIR /var/lib/registry-coordinator
ENTRYPOINT ["/opt/registry-coordinator/bin/coordinator"]
