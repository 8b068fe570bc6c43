"""What several backend passes share: op tables and operand footprints (birutil), the dependence
graph (depgraph), the cost model and the schedule's lower bound (costs), threads and vector clocks
(syncmodel), the exact ACT forms of DVE instructions (engine_choice). No pass lives here."""
