"""Mutation testing of the gate suite: the engine's fault catalogue and `bmoe-ci mutants`."""

from bmoe_ci.mutants.catalogue import Catalogue, CatalogueError, Fault, fault_sites, load_catalogue

__all__ = ["Catalogue", "CatalogueError", "Fault", "fault_sites", "load_catalogue"]
