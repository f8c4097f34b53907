"""The corpus maker of the benchmarks (it lives in dali_autoproxy.tools.corpus; the demo command uses it too).

    python benchmarks/corpus.py ROOT --images 8192
"""
from dali_autoproxy.tools.corpus import PHOTOS, main, make_corpus  # noqa: F401

if __name__ == "__main__":
    main()
