"""A full-screen counter: + / - (or Up / Down) change it, Enter saves, q quits without saving."""
import curses
import sys


def main(scr):
    value = 3
    while True:
        scr.erase()
        scr.addstr(0, 0, "Counter (+/- or Up/Down to change, Enter to save, q to quit)")
        scr.addstr(2, 2, f"value: {value}")
        scr.refresh()
        key = scr.getch()
        if key in (ord("+"), curses.KEY_UP):
            value += 1
        elif key in (ord("-"), curses.KEY_DOWN):
            value -= 1
        elif key in (10, 13, curses.KEY_ENTER):
            with open("/app/count.txt", "w") as f:
                f.write(f"{value}\n")
            return
        elif key == ord("q"):
            return


if __name__ == "__main__":
    if not sys.stdin.isatty():
        sys.exit("counter.py needs a terminal")
    curses.wrapper(main)
