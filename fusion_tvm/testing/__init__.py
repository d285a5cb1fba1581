"""Test utilities: synthetic graphs, fake cost models, random model generators."""
