"""Preferences (Tk): a menu bar with Theme (radio items) and File -> Save settings, which
writes /app/settings.json."""

import json
import os
import tkinter as tk

OUT = "/app/settings.json"
THEMES = {"light": "#f4f4f4", "dark": "#303030", "high-contrast": "#000000"}
FOREGROUND = {"light": "#000000", "dark": "#e8e8e8", "high-contrast": "#ffff00"}

root = tk.Tk()
root.title("Preferences")
root.geometry("520x300+60+50")
theme = tk.StringVar(value="light")
status = tk.StringVar(value="Theme: light (not saved)")
label = tk.Label(root, textvariable=status, font=("DejaVu Sans", 14))
label.place(x=0, y=0, relwidth=1.0, relheight=1.0)


def apply_theme() -> None:
    t = theme.get()
    label.configure(bg=THEMES[t], fg=FOREGROUND[t])
    status.set(f"Theme: {t} (not saved)")


def save() -> None:
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"theme": theme.get()}, f)
    os.replace(OUT + ".tmp", OUT)
    status.set(f"Theme: {theme.get()} (saved)")


menubar = tk.Menu(root)
file_menu = tk.Menu(menubar, tearoff=False)
file_menu.add_command(label="Save settings", underline=0, command=save)
menubar.add_cascade(label="File", menu=file_menu, underline=0)
theme_menu = tk.Menu(menubar, tearoff=False)
theme_menu.add_radiobutton(label="Light", value="light", variable=theme, command=apply_theme)
theme_menu.add_radiobutton(label="Dark", value="dark", variable=theme, command=apply_theme)
theme_menu.add_radiobutton(
    label="High contrast", value="high-contrast", variable=theme, command=apply_theme
)
menubar.add_cascade(label="Theme", menu=theme_menu, underline=0)
root.configure(menu=menubar)
apply_theme()
root.mainloop()
