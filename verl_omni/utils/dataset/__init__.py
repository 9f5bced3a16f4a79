"""Prompt sets for text-to-image RL, written as parquet in verl's ``RLHFDataset`` form."""
