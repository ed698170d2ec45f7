"""The recovery component: run status, lists, inspection, doctor and operator actions."""
