"""Kept for the benchmarks' imports: the corpus maker lives in dali_autoproxy.corpus (the
demo command uses it too)."""
from dali_autoproxy.corpus import PHOTOS, make_corpus  # noqa: F401

if __name__ == "__main__":
    import runpy
    runpy.run_module("dali_autoproxy.corpus", run_name="__main__")
