"""Training loops behind ``kinegen train``: resumable, time-boxed, logged."""
