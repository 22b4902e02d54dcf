"""`tideborn usi`: a net as a USI engine for shogi GUIs (the protocol in `engine`, the thinking in `thinking`)."""
