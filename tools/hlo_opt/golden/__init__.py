"""The golden evaluator: HLO evaluated with numpy on seeded inputs (evaluator.py), and the
GoldenEvaluator job's body around it (run.py). It shares nothing with the Penguin passes but the
HLO reader and op definitions (tools/hlo)."""
