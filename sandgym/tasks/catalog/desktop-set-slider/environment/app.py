"""Volume (Tk): a 0..100 slider and an Apply button that writes /app/volume.json."""

import json
import os
import tkinter as tk

OUT = "/app/volume.json"

root = tk.Tk()
root.title("Volume")
root.geometry("520x240+60+50")
root.resizable(False, False)
volume = tk.IntVar(value=20)
tk.Label(root, text="Volume", font=("DejaVu Sans", 14)).place(x=20, y=15, width=200, height=30)
scale = tk.Scale(
    root,
    from_=0,
    to=100,
    orient="horizontal",
    variable=volume,
    length=460,
    resolution=1,
    takefocus=True,
)
scale.place(x=20, y=60, width=480, height=60)
# Clicking the slider gives it the keyboard focus, so arrow keys fine-tune it afterwards.
scale.bind("<Button-1>", lambda _e: scale.focus_set(), add="+")
status = tk.StringVar(value="Not applied")


def apply() -> None:
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"volume": int(volume.get())}, f)
    os.replace(OUT + ".tmp", OUT)
    status.set(f"Applied volume {volume.get()}")


tk.Button(root, text="Apply", command=apply).place(x=200, y=140, width=120, height=36)
tk.Label(root, textvariable=status).place(x=20, y=195, width=480, height=28)
root.mainloop()
