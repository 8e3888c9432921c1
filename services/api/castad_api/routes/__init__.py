"""The gateway's HTTP routes, a module for each thing they serve; app.py includes their routers in this order.

pipelines (create, remake, cancel, retry; providers' callbacks), pipeline_views (read, list, follow), downloads (a
pipeline's files), webhooks (the notices of a pipeline's end), images (uploads), timeline (a pipeline's timeline and
the stream of every pipeline), stats, dead_letters, keys, brand, reviews, usage; console (the operator's console,
mounted beside the API); common (what several of them share). Each calls the module of the package around it that
holds its aggregate's statements (repository.py's docstring maps them: pipelines and stages there, timeline_rows.py,
listing.py, dead_letters.py, uploaded.py, keys.py, brands.py, reviews.py, usage.py, webhooks.py), and creation.py,
operations.py and decisions.py for what makes or moves a pipeline.
"""
