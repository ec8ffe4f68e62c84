"""The scripted expert's helper library, one module per part (core, judging, placing, drawer), each a cell's text.

agent/expert.py reads each module's source at import and sends the text below its marker line, as it stands, in the
first cell that needs the part; the agent's Python session defines it there. The modules are real Python so that
they are linted and imported by the tests; what each takes from the session is imported under TYPE_CHECKING only.
"""
