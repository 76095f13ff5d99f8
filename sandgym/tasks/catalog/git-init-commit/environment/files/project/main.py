from lib.util import greet

print(greet('world'))
