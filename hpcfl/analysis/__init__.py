"""Reading many runs: ``hpcfl report`` tables (:mod:`.report`), plots (:mod:`.plots`), and
the grouping of runs by their differing config keys (:mod:`.runs`)."""
