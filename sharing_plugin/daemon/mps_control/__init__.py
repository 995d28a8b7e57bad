"""`sharing-plugin mps-control`: one MPS control daemon per MPS resource, kept in step with the
node pipeline's plans."""
