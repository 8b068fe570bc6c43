"""HLO as ncc reads it: text and protobuf readers, a text printer (what ncc reduce writes), element
types, the verifier, literals and the numpy semantics of elementwise ops. The frontend (hlo2penguin)
and the golden evaluator (hlo_opt) both import it, so each op is parsed, checked and defined in one
place."""
