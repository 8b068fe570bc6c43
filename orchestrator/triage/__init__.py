"""After a failed or wrong compile: what happened, a reproducer, a smaller module, the pass.

    explain         `ncc triage`: explain and bucket failed compiles from their work dirs
    bundle          a failed job as a self-contained reproducer (replay.sh; supervise.py, the
                    stdlib-only watchdog it replays under, is copied in as it is)
    reduce          `ncc reduce`'s delta-debugging loop and its parallel runner
    reduce_edits    the candidate edits of an HloModuleProto
    interestingness a test script, or a work dir's failure replayed and judged by its signature
    bisect          `ncc bisect`: the first pass after which a compile's result stops matching its
                    golden outputs (reruns hlo_opt / walrus_driver on prefixes of its pass list)
"""
