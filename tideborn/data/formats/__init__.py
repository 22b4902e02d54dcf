"""The files as they lie on disk: record layouts and file kinds (`records`), game records in
CSA, KIF and KI2 (`games`), and the game index that pairs a split's train and test files (`game_index`).
"""
