"""Running a job: trainer -> controller -> worker group -> worker actors -> sessions. Driver and workers."""
