"""The alignment evaluation corpus (issue 14): cases, their truth, replay, oracle and scores.

    from scripts.benchlib.corpus.cases import select
    from scripts.benchlib.corpus.run import run_case
    for case in select("tune"):
        result = run_case(case)   # built, replayed offline, scored; result.scored per modality

``scripts/bench_align.py --corpus [--set tune|heldout|all] [--kind K] [--plots DIR]``
prints the tables; ``scripts/make_corpus.py`` made the real clips under
``tests/data/corpus/``. Modules: cases (the list and the held-out set), truth,
content/render/synth (synthetic generators), clips (real files), build (a case's
streams), replay (the offline harness), oracle, score, run, plots, live (the clips
through ``mmsync produce --video --realtime`` and a real worker), cli.
"""
