#!/bin/bash
# Started in the background at reset by sandboxes.desktop.start_task_desktop.
exec python3 /opt/desktop-app/app.py
