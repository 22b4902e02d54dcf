"""`python -m tideborn.data`: check, convert and split data files (`cli`, `checks`, `convert`, `split`,
`progress`).
"""
