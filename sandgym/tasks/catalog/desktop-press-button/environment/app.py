"""Quiz (Tk): a row of numbered buttons; every press is appended to /app/presses.log."""

import tkinter as tk

OUT = "/app/presses.log"
CHOICES = [44, 41, 39, 42, 40, 43]

root = tk.Tk()
root.title("Quiz")
root.geometry("520x220+60+50")
root.resizable(False, False)
tk.Label(root, text="Press the button that shows 17 + 25.", font=("DejaVu Sans", 14)).place(
    x=20, y=25, width=480, height=40
)
status = tk.StringVar(value="")


def press(value: int) -> None:
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(f"{value}\n")
    status.set(f"You pressed {value}.")


for i, value in enumerate(CHOICES):
    tk.Button(root, text=str(value), command=lambda v=value: press(v)).place(
        x=20 + 80 * i, y=100, width=70, height=40
    )
tk.Label(root, textvariable=status).place(x=20, y=160, width=480, height=30)
root.mainloop()
