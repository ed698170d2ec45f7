"""Code shared by every Registry Coordinator component and by coordinatorctl."""

__version__ = "0.1.0.dev0"
