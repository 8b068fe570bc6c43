"""`ncc farm`: many models compiled as one Luigi task graph, with the embedded scheduler or
joined with other workers on a `luigid` (docs/farm.md).

    model       FarmInput / FarmModel: a model to compile and the input lines that asked for it
    farm        reading the inputs, one pipeline per distinct (model, flags), running the graph,
                the farm's report
    progress    the farm's live status line, read from the work dirs
"""
