"""The part of the tool runner that runs inside the sandbox. Standard library only: it is packed into
one zipapp and run by whatever Python the sandbox's image has."""
