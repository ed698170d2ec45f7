"""The deployment lifecycle: plan, apply, deployment-status and the startup activation check.

``coordinatorctl`` calls :func:`plan`, :func:`apply` and :func:`status` with a
:class:`core.config.model.CheckedDeployment`; every component calls
:func:`verify_activation` on its own connection before it serves.
"""

from core.deploy.activation import verify_activation
from core.deploy.commands import apply, plan, status
from core.deploy.model import Activation, ActivePackage, DeploymentStatus, PlanEntry

__all__ = [
    "Activation",
    "ActivePackage",
    "DeploymentStatus",
    "PlanEntry",
    "apply",
    "plan",
    "status",
    "verify_activation",
]
