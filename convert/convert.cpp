// Filled in with the HF -> .qf converter.
