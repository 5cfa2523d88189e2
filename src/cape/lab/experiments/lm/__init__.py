"""The language-model experiment: a causal LM trained at context L on real text, evaluated at
1x-16x L."""
