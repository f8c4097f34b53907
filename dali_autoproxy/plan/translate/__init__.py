"""Translating torchvision transforms into IR ops: the registry (``registry.py``) and one
converter module per family, each registering its converters when imported: importing the
package imports them all, so that having the package is having every converter."""
import importlib
import pkgutil

from dali_autoproxy.plan.translate.registry import (
    Converter,
    chain_of,
    coin_drawer,
    compose_types,
    flatten,
    is_chain,
    lookup,
    register,
    register_equivalent,
    transform_name,
    v2_params,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Converter", "register", "register_equivalent", "lookup", "flatten", "is_chain", "compose_types",
           "transform_name", "coin_drawer", "v2_params", "chain_of"]
