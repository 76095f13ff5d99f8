"""A full-screen menu: arrow keys (or j/k) move, Enter selects, q quits without choosing."""
import curses
import sys

ITEMS = ["red", "green", "blue", "teal", "amber"]


def main(scr):
    curses.curs_set(0)
    pos = 0
    while True:
        scr.erase()
        scr.addstr(0, 0, "Pick a colour (arrows/j/k, Enter to choose, q to quit)")
        for i, item in enumerate(ITEMS):
            scr.addstr(2 + i, 2, ("> " if i == pos else "  ") + item,
                       curses.A_REVERSE if i == pos else curses.A_NORMAL)
        scr.refresh()
        key = scr.getch()
        if key in (curses.KEY_UP, ord("k")):
            pos = (pos - 1) % len(ITEMS)
        elif key in (curses.KEY_DOWN, ord("j")):
            pos = (pos + 1) % len(ITEMS)
        elif key in (10, 13, curses.KEY_ENTER):
            with open("/app/choice.txt", "w") as f:
                f.write(ITEMS[pos] + "\n")
            return
        elif key == ord("q"):
            return


if __name__ == "__main__":
    if not sys.stdin.isatty():
        sys.exit("menu.py needs a terminal")
    curses.wrapper(main)
