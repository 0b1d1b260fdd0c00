"""Renderers at the edge: text, plotly figures and the HTML report."""
