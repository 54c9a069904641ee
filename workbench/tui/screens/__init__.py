"""Modal screens: confirmation, new run, save-as."""
