"""Planets (Tk): a short scrolling list; opening an item (double-click or Enter) writes its
name to /app/choice.txt."""

import os
import tkinter as tk

OUT = "/app/choice.txt"
PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune", "Pluto"]

root = tk.Tk()
root.title("Planets")
root.geometry("360x260+80+60")
root.resizable(False, False)
frame = tk.Frame(root)
frame.place(x=20, y=20, width=320, height=150)
scrollbar = tk.Scrollbar(frame, orient="vertical")
listbox = tk.Listbox(
    frame, height=5, font=("DejaVu Sans", 14), yscrollcommand=scrollbar.set, exportselection=False
)
scrollbar.configure(command=listbox.yview)
scrollbar.pack(side="right", fill="y")
listbox.pack(side="left", fill="both", expand=True)
for name in PLANETS:
    listbox.insert("end", name)
status = tk.StringVar(value="Double-click a planet to open it.")


def open_selected(_event: object = None) -> None:
    sel = listbox.curselection()
    if not sel:
        return
    name = listbox.get(sel[0])
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        f.write(name + "\n")
    os.replace(OUT + ".tmp", OUT)
    status.set(f"Opened {name}.")


listbox.bind("<Double-Button-1>", open_selected)
listbox.bind("<Return>", open_selected)
tk.Label(root, textvariable=status).place(x=20, y=190, width=320, height=30)
root.mainloop()
