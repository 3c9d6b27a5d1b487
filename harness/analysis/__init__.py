"""Analyses that read the store: matrix, compare, history, query, recommend, predict."""
