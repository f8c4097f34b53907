"""Translating torchvision transforms into IR ops: the registry (``registry.py``) and one
converter module per family, each registering its converters when imported (here, so that
importing the package is having every converter)."""
from dali_autoproxy.plan.translate import affine, color, compose, filters, geometry, policies, tensor, timm  # noqa: F401,E402  (registration)
from dali_autoproxy.plan.translate.registry import (
                                                    Converter,
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

__all__ = ["Converter", "register", "register_equivalent", "lookup", "flatten", "is_chain", "compose_types",
           "transform_name", "coin_drawer", "v2_params"]
