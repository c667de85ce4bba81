"""The alignment evaluation corpus (issue 14): cases, their truth, replay, oracle and scores.

    from scripts.benchlib.corpus import select, build, replay_case
    for case in select("tune"):
        result = replay_case(case)      # windows scored against the truth

``scripts/bench_align.py --corpus`` prints the tables; ``scripts/make_corpus.py``
made the real clips under ``tests/data/corpus/``.
"""
