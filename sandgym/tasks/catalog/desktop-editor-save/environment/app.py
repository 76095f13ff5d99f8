"""Notes (Tk): a plain text editor; Ctrl+S saves the text to /app/notes.txt."""

import os
import tkinter as tk

OUT = "/app/notes.txt"

root = tk.Tk()
root.title("Notes - untitled")
root.geometry("640x420+50+40")
text = tk.Text(root, wrap="word", undo=True, font=("DejaVu Sans Mono", 12))
text.place(x=0, y=0, relwidth=1.0, height=390)
status = tk.StringVar(value="Ctrl+S saves to " + OUT)
tk.Label(root, textvariable=status, anchor="w").place(x=6, y=392, relwidth=1.0, height=26)


def save(_event: object = None) -> str:
    body = text.get("1.0", "end-1c")
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(OUT + ".tmp", OUT)
    root.title("Notes - saved")
    status.set(f"Saved {len(body)} characters to {OUT}")
    return "break"


root.bind_all("<Control-s>", save)
text.focus_set()
root.mainloop()
