"""Runtime shared by Castad's services: database, outbox, inbox, messaging, stage machine."""
